# The controller image: `sandbox-controller serve | worker | scheduler`, as the Helm chart runs it
# (command ["sandbox-controller"], args [<role>, ...]). It holds the controller package only.
#
#   docker build -t sandbox-controller/sandbox-controller:0.1.0 .
#
# The Agents API simulator (package agents_simulator, commands `simulator` and `dev`) is not in
# it. The opt-in cluster test tier runs the simulator from a separate target of this file:
#
#   docker build --target simulator -t sandbox-controller-simulator:dev .
#
# Pinned base (override with --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:...
# where your registry policy asks for digests). Any base with Python >= 3.11 and its venv module
# works: the real-node test tier builds this file from a Debian base it bootstrapped itself
# (tests/node/images.sh). Runs as uid/gid 10001, matching the chart's podSecurityContext;
# nothing is written at run time except /tmp (an emptyDir in the chart, whose root filesystem
# is read-only).
#
# Dependencies: exactly the product's share of the Python lock, lock/product.txt (README,
# "Reproducible installs"), with every file's sha256 checked (pip's --require-hashes refuses a
# file that differs and any package the lock does not pin), then the package itself with no
# dependency resolution and no build isolation (its build backend is in the lock too). So the
# image runs the versions the tests ran.
#
# Offline builds: PIP_FIND_LINKS names a directory of wheels (lock/product.txt's files, e.g.
# `pip download --no-deps --only-binary=:all: --require-hashes -r lock/product.txt -d wheels`)
# mounted into the build, e.g. `podman build -v "$PWD/wheels:/wheels:ro"
# --build-arg PIP_FIND_LINKS=/wheels`; pip then reads nothing but that directory.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
FROM ${PYTHON_IMAGE} AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
ARG PIP_FIND_LINKS=""
ENV PIP_FIND_LINKS=${PIP_FIND_LINKS}

# The package lives in its own virtual environment (distribution Pythons refuse system-wide pip
# installs); /opt/venv/bin is first on PATH, so `sandbox-controller` and `python` are its own.
RUN groupadd --gid 10001 controller \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin controller \
 && python3 -m venv /opt/venv

# Test tier only: the controller plus the simulator (`sandbox-controller simulator ...`).
FROM base AS simulator
WORKDIR /src
COPY lock/product.txt ./lock/product.txt
RUN pip install ${PIP_FIND_LINKS:+--no-index} --require-hashes -r lock/product.txt
COPY pyproject.toml README.md LICENSE ./
COPY controller ./controller
COPY agents_simulator ./agents_simulator
RUN pip install ${PIP_FIND_LINKS:+--no-index} --no-deps --no-build-isolation . \
 && rm -rf /src \
 && sandbox-controller simulator --help >/dev/null
ENV HOME=/tmp
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["sandbox-controller"]
CMD ["simulator", "--help"]

# The production image (the default target): the controller package alone.
FROM base AS controller
WORKDIR /src
COPY lock/product.txt ./lock/product.txt
RUN pip install ${PIP_FIND_LINKS:+--no-index} --require-hashes -r lock/product.txt
COPY pyproject.toml README.md LICENSE ./
COPY controller ./controller
RUN pip install ${PIP_FIND_LINKS:+--no-index} --no-deps --no-build-isolation . \
 && rm -rf /src \
 && sandbox-controller --version

ENV HOME=/tmp
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080

ENTRYPOINT ["sandbox-controller"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
