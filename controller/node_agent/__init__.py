"""The node agent (``sandbox-controller node-agent``; one per sandbox node, the chart's
DaemonSet): the node's half of suspend with memory on Kubernetes, the protocol of
``controller.runners.kubernetes.checkpoints``.

It looks at the managed sandbox pods of the sandbox namespace bound to its node
(``pending``). For a pod with a checkpoint request and no answer it asks its kubelet for the
checkpoint archive of the sandbox container (``kubelet``), makes it a checkpoint image
(``images``) named ``checkpoints.image_ref(<namespace>, <the pod's workspace claim>, <pod uid>)`` in the
node's containerd (``containerd``), removes the archive (``archives``) and answers on the pod:
the image, its size and the seconds it took, or the error. One checkpoint at a time. Between
requests it deletes the checkpoint images nothing names any more (``collection``) and the
archives a crashed agent left. ``agent`` is the loop; every decision is a plain function of
``pending``, ``archives`` and ``collection``.
"""
