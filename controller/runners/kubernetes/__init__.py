"""The Kubernetes runner: one pod (and workspace PVC) per session.

``runner`` is the runner protocol and the cold start; ``placement`` places the pods of a
template with a warm pool (claims and placement records) and tends the pools, as ``pool``
decides; ``watch`` follows the sandbox pods for the scheduler. All of them reach the API server
through ``api``, the one door (the only module that imports the client), in the project's own
values (``objects``). ``manifests`` builds pod and PVC bodies from a sandbox template; ``names``
holds the labels and names they carry; ``templates`` reads the templates file.
"""
