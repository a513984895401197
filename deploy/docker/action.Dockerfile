# faasdl's action runtime: OpenWhisk's Python 3.11 image (its actionloop proxy answers /init and
# /run) with TensorFlow and faasdl installed, deployed as a blackbox action
# (FAASDL_OPENWHISK__ACTION_IMAGE): the controller still sends each action's code to /init.
# Build from the repository root:
#   docker build -f deploy/docker/action.Dockerfile -t REGISTRY/faasdl-action:0.1.0 .
# A GPU variant: --build-arg TENSORFLOW="tensorflow[and-cuda]==2.21.0", on invoker nodes with
# NVIDIA's device plugin (OpenWhisk's pod builder sets no GPU resources: give the invokers' action
# pods a GPU through a RuntimeClass or a node-wide default).
FROM openwhisk/action-python-v3.11:4546acf

ARG TENSORFLOW=tensorflow-cpu==2.21.0

# No directory is shared between action pods, or with the controller: every blob goes to the
# store in chunks (FAASDL_STORE__SPILL_BYTES=0, as the chart sets the controller's), none to a
# spill file that only the pod that wrote it could read. The controller's own store settings,
# set on the actions it deploys as init parameters, take the place of this one.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FAASDL_STORE__SPILL_BYTES=0

WORKDIR /opt/faasdl
COPY pyproject.toml README.md ./
COPY faasdl ./faasdl
COPY openwhisk_actions ./openwhisk_actions
RUN pip install "${TENSORFLOW}" ".[train]" && rm -rf /opt/faasdl/build

# The proxy writes each action's code under /action at /init: that directory is the runtime
# user's, nothing else is.
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin faasdl \
    && mkdir -p /action && chown -R 10001 /action
USER 10001
WORKDIR /action
