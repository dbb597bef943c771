"""The Kubernetes runner: one pod (and workspace PVC) per session.

``runner`` talks to the API server; ``manifests`` builds pod and PVC bodies from a sandbox
template; ``names`` holds the labels and names they carry; ``templates`` reads the templates file.
"""
