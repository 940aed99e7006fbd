# The three scripts in an image, for the Kubernetes examples
# (examples/jobset-*.yaml, tfjob-*.yaml and vcjob-tf2.yaml), on a public
# Python image:
#   podman build -t mnist-dist .     (or docker build)
# For GPU workers, the same with the CUDA libraries TensorFlow needs, as
# TensorFlow installs them (pip's tensorflow[and-cuda], about 3 GB more, at
# requirements.txt's version); the node gives the driver:
#   podman build --build-arg TF_EXTRAS=and-cuda -t mnist-dist:gpu .
# Without them, a worker given a GPU ends at start-up saying so.
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TF_EXTRAS=
WORKDIR /app
COPY requirements.txt .
RUN python3 -m pip install --no-cache-dir -r requirements.txt \
    ${TF_EXTRAS:+"tensorflow[$TF_EXTRAS]"}
COPY mnist_dist_async.py mnist_dist_sync.py mnist_dist_tf2.py cluster_utils.py \
     tf2_utils.py mnist_data.py ./
COPY ps_cluster/ ps_cluster/
ENTRYPOINT ["python3"]
