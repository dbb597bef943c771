"""The checkpoint image: a kubelet's checkpoint archive as an OCI image a node's containerd
restores a container from (pure but for writing the one file).

containerd 2.3's CRI plugin, with ``enable_experimental_restore_via_create``, treats an image as
a checkpoint when its index (or manifest) carries the annotation
``org.criu.checkpoint.container.name``: it mounts the image's root filesystem (the archive's
files, unpacked as its one layer), reads the dumps from there and has runc restore the process
tree into the new pod's container. The image is written as an OCI archive for ``ctr image
import`` (no registry, no buildah): one uncompressed layer that is the archive itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

CHECKPOINT_ANNOTATION = "org.criu.checkpoint.container.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
PLATFORM = {"architecture": "amd64", "os": "linux"}


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def write_checkpoint_image(archive: Path, out: Path, ref: str, container: str) -> Path:
    """Write ``out``, an OCI archive holding ``ref``: a checkpoint image of ``container`` (its
    name in the pod) whose one layer is ``archive`` (the kubelet's checkpoint tar)."""
    layer_digest = _file_digest(archive)
    layer_size = archive.stat().st_size
    config = json.dumps({**PLATFORM, "rootfs": {"type": "layers", "diff_ids": [layer_digest]}, "config": {}}).encode()
    annotations = {CHECKPOINT_ANNOTATION: container}
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer_digest, "size": layer_size}],
            "annotations": annotations,
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST_MEDIA_TYPE,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": PLATFORM,
                    "annotations": {REF_ANNOTATION: ref},
                }
            ],
            "annotations": annotations,
        }
    ).encode()

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(out, "w") as tar:
        add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add(tar, "index.json", index)
        for blob in (config, manifest):
            add(tar, f"blobs/sha256/{_digest(blob).removeprefix('sha256:')}", blob)
        tar.add(archive, arcname=f"blobs/sha256/{layer_digest.removeprefix('sha256:')}")
    return out
