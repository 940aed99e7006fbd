"""Unit tests of cluster_utils: host lists, IDX files, the data split."""

import gzip
import hashlib
import http.server
import os
import threading

import numpy as np
import pytest

import cluster_utils
from conftest import write_dataset, write_idx


@pytest.mark.parametrize('value, hosts', [
    ('localhost:9001', ['localhost:9001']),
    ('a:1, b.example.org:2,10.0.0.3:65535',
     ['a:1', 'b.example.org:2', '10.0.0.3:65535']),
    ('[::1]:9001', ['[::1]:9001']),
])
def test_parse_host_list(value, hosts):
    assert cluster_utils.parse_host_list(value) == hosts


@pytest.mark.parametrize('value', [
    '', 'localhost', 'localhost:', ':9001', 'localhost:port',
    'localhost:0', 'localhost:65536', 'a:1,,b:2', 'a:1;b:2'])
def test_parse_host_list_rejects(value):
    with pytest.raises(ValueError, match='is not host:port'):
        cluster_utils.parse_host_list(value)


def test_read_idx_round_trip(tmp_path):
    array = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    write_idx(tmp_path / 'a.gz', array)
    np.testing.assert_array_equal(cluster_utils.read_idx(str(tmp_path / 'a.gz')),
                                  array)


def test_read_idx_truncated(tmp_path):
    write_idx(tmp_path / 'a.gz', np.zeros((10, 28, 28)))
    data = open(tmp_path / 'a.gz', 'rb').read()
    open(tmp_path / 'a.gz', 'wb').write(data[:len(data) // 2])
    with pytest.raises(cluster_utils.DataError, match='truncated or corrupt'):
        cluster_utils.read_idx(str(tmp_path / 'a.gz'))


def test_read_idx_size_does_not_match_header(tmp_path):
    with gzip.open(tmp_path / 'a.gz', 'wb') as f:
        f.write(bytes([0, 0, 8, 1, 0, 0, 0, 5]) + b'abc')
    with pytest.raises(cluster_utils.DataError, match='does not match'):
        cluster_utils.read_idx(str(tmp_path / 'a.gz'))


def test_read_idx_not_idx(tmp_path):
    with gzip.open(tmp_path / 'a.gz', 'wb') as f:
        f.write(b'<html>not found</html>')
    with pytest.raises(cluster_utils.DataError, match='not an IDX file'):
        cluster_utils.read_idx(str(tmp_path / 'a.gz'))


def test_read_idx_not_gzip(tmp_path):
    (tmp_path / 'a.gz').write_bytes(b'plain text')
    with pytest.raises(cluster_utils.DataError, match='corrupt'):
        cluster_utils.read_idx(str(tmp_path / 'a.gz'))


def test_read_data_sets_split(tmp_path):
    write_dataset(tmp_path, num_train=300, num_test=40)
    mnist = cluster_utils.read_data_sets(str(tmp_path), validation_size=50)
    assert mnist.train.images.shape == (250, 784)
    assert mnist.validation.images.shape == (50, 784)
    assert mnist.test.images.shape == (40, 784)
    assert mnist.train.labels.shape == (250, 10)
    for split in mnist:
        assert split.images.dtype == np.float32
        assert 0 <= split.images.min() and split.images.max() <= 1
        np.testing.assert_array_equal(split.labels.sum(axis=1), 1)
    # The validation images are the first ones of the training file.
    raw = cluster_utils.read_idx(str(tmp_path / 'train-images-idx3-ubyte.gz'))
    np.testing.assert_allclose(mnist.validation.images,
                               raw[:50].reshape(50, 784) / 255)
    np.testing.assert_allclose(mnist.train.images,
                               raw[50:].reshape(250, 784) / 255)


def test_read_data_sets_smaller_than_validation(tmp_path):
    write_dataset(tmp_path, num_train=100, num_test=10)
    with pytest.raises(cluster_utils.DataError,
                       match='100 training images, not more than '
                             '--validation_size=100'):
        cluster_utils.read_data_sets(str(tmp_path), validation_size=100)


def test_read_data_sets_wrong_shape(tmp_path):
    write_dataset(tmp_path, num_train=100, num_test=10)
    write_idx(tmp_path / 't10k-images-idx3-ubyte.gz', np.zeros((10, 8, 8)))
    with pytest.raises(cluster_utils.DataError, match='28x28'):
        cluster_utils.read_data_sets(str(tmp_path), validation_size=10)


def test_epoch_batches_cover_the_split_once():
    split = cluster_utils.Split(np.arange(10.0)[:, None], np.arange(10)[:, None])
    batches = list(cluster_utils.epoch_batches(
        split, 3, np.random.default_rng(0)))
    assert [len(x) for x, _ in batches] == [3, 3, 3]
    seen = np.concatenate([x for x, _ in batches]).ravel()
    assert len(set(seen)) == 9
    for x, y in batches:  # images and labels stay paired
        np.testing.assert_array_equal(x, y)


@pytest.fixture
def http_server(tmp_path):
    """Serves tmp_path/'served' over HTTP on a loopback port."""
    served = tmp_path / 'served'
    served.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, 'http://127.0.0.1:%d/' % server.server_port
    server.shutdown()


def test_download_checks_sha256(http_server, tmp_path):
    served, url = http_server
    (served / 'f.gz').write_bytes(b'payload')
    digest = hashlib.sha256(b'payload').hexdigest()
    target = tmp_path / 'data' / 'f.gz'
    cluster_utils.download(url + 'f.gz', digest, str(target))
    assert target.read_bytes() == b'payload'

    with pytest.raises(cluster_utils.DataError, match='wrong SHA-256'):
        cluster_utils.download(url + 'f.gz', '0' * 64, str(tmp_path / 'g.gz'))
    # All or nothing: no partial or temporary file is left behind.
    assert sorted(os.listdir(tmp_path / 'data')) == ['f.gz']
    assert not (tmp_path / 'g.gz').exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith('tmp')] == []


def test_download_missing_file(http_server, tmp_path):
    _, url = http_server
    with pytest.raises(OSError):
        cluster_utils.download(url + 'nothing.gz', '0' * 64,
                               str(tmp_path / 'x.gz'))
    assert os.listdir(tmp_path) == ['served']
