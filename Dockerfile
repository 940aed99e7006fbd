# The three scripts in an image, for the Kubernetes examples
# (examples/jobset-*.yaml, tfjob-*.yaml and vcjob-tf2.yaml).
# CPU by default, on a public Python image; for GPU workers, a base with CUDA
# and TensorFlow, whose TensorFlow requirements.txt then keeps:
#   podman build -t mnist-dist .     (or docker build)
#   podman build --build-arg BASE=tensorflow/tensorflow:2.21.0-gpu -t mnist-dist:gpu .
ARG BASE=python:3.11-slim
FROM ${BASE}
WORKDIR /app
COPY requirements.txt .
RUN python3 -m pip install --no-cache-dir -r requirements.txt
COPY mnist_dist_async.py mnist_dist_sync.py mnist_dist_tf2.py cluster_utils.py \
     tf2_utils.py mnist_data.py ./
COPY ps_cluster/ ps_cluster/
ENTRYPOINT ["python3"]
