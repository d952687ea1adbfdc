# The model server as an ordinary image, for machines that can pull a Python base image.
# (Tests here have no registry: containers/backends/docker.py builds a registry-free image instead.)
#
#   docker build -t autotune-server .
#   docker run --rm -p 127.0.0.1:8000:8000 -v "$PWD/runs/mlp/artifact:/artifact:ro" autotune-server
#   docker run --rm --network host -v /path/to/artifact:/artifact:ro autotune-server /artifact --port 9000
#
# Publish on 127.0.0.1 as above: a bare `-p 8000:8000` publishes on every interface of the host, and the
# server has no authentication. (With --network host it binds 127.0.0.1, its default.) Add
# `--cap-drop ALL --security-opt no-new-privileges` as autotune's Docker backend does, and
# `--user "$(id -u):$(id -g)"` for an artifact only its owner can read.
FROM python:3.11-slim

# torch's CPU build; the default index would bring gigabytes of CUDA libraries a CPU server never loads.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

COPY . /tmp/autotune
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX_URL" /tmp/autotune \
    && rm -rf /tmp/autotune \
    && useradd --create-home --uid 10001 autotune

USER autotune
WORKDIR /home/autotune

# The server listens on the --port it is given (8000 with the default arguments below). The default
# arguments bind 0.0.0.0 inside the container's own network namespace, which a -p mapping needs to
# reach it; where it is reachable from is what -p says, so publish it as -p 127.0.0.1:8000:8000.
EXPOSE 8000
ENTRYPOINT ["python", "-m", "containers.server"]
CMD ["/artifact", "--port", "8000", "--host", "0.0.0.0"]
