# faasdl's controller (`faasdl serve`): the REST API, admission and job runners. No TensorFlow.
# Build from the repository root:
#   docker build -f deploy/docker/controller.Dockerfile -t REGISTRY/faasdl-controller:0.1.0 .
FROM python:3.11.10-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin faasdl

WORKDIR /opt/faasdl
COPY pyproject.toml README.md ./
COPY faasdl ./faasdl
COPY openwhisk_actions ./openwhisk_actions
# The base install (controller, platform clients, stores) and the Kubernetes adapter.
RUN pip install ".[kubernetes]" && rm -rf /opt/faasdl/build

USER 10001
EXPOSE 8080
ENTRYPOINT ["faasdl"]
CMD ["serve"]
