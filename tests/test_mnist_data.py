"""Unit tests of mnist_data: IDX files, the split, batches, downloads, and
its command line."""

import gzip
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import mnist_data
from conftest import REPO, START_UP, write_dataset, write_idx


def test_read_idx_round_trip(tmp_path):
    array = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    write_idx(tmp_path / 'a.gz', array)
    np.testing.assert_array_equal(mnist_data.read_idx(str(tmp_path / 'a.gz')),
                                  array)


def test_read_idx_truncated(tmp_path):
    write_idx(tmp_path / 'a.gz', np.zeros((10, 28, 28)))
    data = open(tmp_path / 'a.gz', 'rb').read()
    open(tmp_path / 'a.gz', 'wb').write(data[:len(data) // 2])
    with pytest.raises(mnist_data.DataError, match='truncated or corrupt'):
        mnist_data.read_idx(str(tmp_path / 'a.gz'))


def test_read_idx_size_does_not_match_header(tmp_path):
    with gzip.open(tmp_path / 'a.gz', 'wb') as f:
        f.write(bytes([0, 0, 8, 1, 0, 0, 0, 5]) + b'abc')
    with pytest.raises(mnist_data.DataError, match='does not match'):
        mnist_data.read_idx(str(tmp_path / 'a.gz'))


def test_read_idx_not_idx(tmp_path):
    with gzip.open(tmp_path / 'a.gz', 'wb') as f:
        f.write(b'<html>not found</html>')
    with pytest.raises(mnist_data.DataError, match='not an IDX file'):
        mnist_data.read_idx(str(tmp_path / 'a.gz'))


def test_read_idx_not_gzip(tmp_path):
    (tmp_path / 'a.gz').write_bytes(b'plain text')
    with pytest.raises(mnist_data.DataError, match='corrupt'):
        mnist_data.read_idx(str(tmp_path / 'a.gz'))


def test_read_data_sets_split(tmp_path):
    write_dataset(tmp_path, num_train=300, num_test=40)
    mnist = mnist_data.read_data_sets(str(tmp_path), validation_size=50)
    assert mnist.train.images.shape == (250, 784)
    assert mnist.validation.images.shape == (50, 784)
    assert mnist.test.images.shape == (40, 784)
    assert mnist.train.labels.shape == (250,)
    # Kept as stored: a byte a pixel and a label.
    for split in mnist:
        assert split.images.dtype == split.labels.dtype == np.uint8
    # The validation images are the first ones of the training file.
    raw = mnist_data.read_idx(str(tmp_path / 'train-images-idx3-ubyte.gz'))
    np.testing.assert_array_equal(mnist.validation.images,
                                  raw[:50].reshape(50, 784))
    np.testing.assert_array_equal(mnist.train.images,
                                  raw[50:].reshape(250, 784))


def test_as_float_is_what_the_model_takes():
    split = mnist_data.Split(np.array([[0, 51, 255]], np.uint8),
                             np.array([3], np.uint8))
    images, labels = mnist_data.as_float(split)
    assert images.dtype == labels.dtype == np.float32
    np.testing.assert_allclose(images, [[0, 0.2, 1]])
    np.testing.assert_array_equal(labels, [[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]])


def test_read_data_sets_smaller_than_validation(tmp_path):
    write_dataset(tmp_path, num_train=100, num_test=10)
    with pytest.raises(mnist_data.DataError,
                       match='100 training images, not more than '
                             '--validation_size=100'):
        mnist_data.read_data_sets(str(tmp_path), validation_size=100)


def test_read_data_sets_wrong_shape(tmp_path):
    write_dataset(tmp_path, num_train=100, num_test=10)
    write_idx(tmp_path / 't10k-images-idx3-ubyte.gz', np.zeros((10, 8, 8)))
    with pytest.raises(mnist_data.DataError, match='28x28'):
        mnist_data.read_data_sets(str(tmp_path), validation_size=10)


def test_epoch_batches_cover_the_split_once():
    # Image k is all pixels k, its label k % 10.
    split = mnist_data.Split(np.repeat(np.arange(10, dtype=np.uint8), 784)
                             .reshape(10, 784), np.arange(10, dtype=np.uint8))
    batches = list(mnist_data.epoch_batches(
        split, 3, np.random.default_rng(0)))
    assert [len(x) for x, _ in batches] == [3, 3, 3]
    seen = np.concatenate([x[:, 0] for x, _ in batches]) * 255
    assert len(set(np.round(seen))) == 9
    for x, y in batches:  # as_float, images and labels still paired
        assert x.dtype == y.dtype == np.float32
        np.testing.assert_allclose(x[:, 0] * 255, np.argmax(y, 1))


def test_download_checks_sha256(http_server, tmp_path):
    served, url, _ = http_server
    (served / 'f.gz').write_bytes(b'payload')
    digest = hashlib.sha256(b'payload').hexdigest()
    target = tmp_path / 'data' / 'f.gz'
    mnist_data.download(url + 'f.gz', digest, str(target))
    assert target.read_bytes() == b'payload'

    with pytest.raises(mnist_data.DataError, match='wrong SHA-256'):
        mnist_data.download(url + 'f.gz', '0' * 64, str(tmp_path / 'g.gz'))
    # All or nothing: no partial or temporary file is left behind.
    assert sorted(os.listdir(tmp_path / 'data')) == ['f.gz']
    assert not (tmp_path / 'g.gz').exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith('tmp')] == []


def test_download_missing_file(http_server, tmp_path):
    _, url, _ = http_server
    with pytest.raises(OSError):
        mnist_data.download(url + 'nothing.gz', '0' * 64,
                               str(tmp_path / 'x.gz'))
    assert os.listdir(tmp_path) == ['served']


def sha256(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_download_from_a_mirror(http_server, tmp_path, monkeypatch):
    served, url, requested = http_server
    write_dataset(served, num_train=300, num_test=40)
    # Files of this mirror's own, accepted by their own checksums.
    monkeypatch.setattr(mnist_data, 'FILES', {
        name: sha256(served / name) for name in mnist_data.FILES})
    mnist = mnist_data.read_data_sets(str(tmp_path / 'data'), 50,
                                      mirror=url.rstrip('/'))
    assert mnist.test.images.shape == (40, 784)
    assert sorted(requested) == sorted('/' + n for n in mnist_data.FILES)


def test_download_from_a_mirror_checks_sha256(http_server, tmp_path):
    served, url, requested = http_server
    write_dataset(served, num_train=300, num_test=40)
    with pytest.raises(mnist_data.DataError,
                       match=r'train-images-idx3-ubyte.gz not found in .* '
                             r'\(%strain-images-idx3-ubyte.gz has the wrong '
                             r'SHA-256\)' % url):
        mnist_data.read_data_sets(str(tmp_path / 'data'), 50, mirror=url)
    # Only the mirror was asked, and nothing it sent was kept.
    assert requested == ['/train-images-idx3-ubyte.gz']
    assert os.listdir(tmp_path / 'data') == []


def run_command_line(*args):
    return subprocess.run([sys.executable, 'mnist_data.py'] + list(args),
                          cwd=REPO, capture_output=True, text=True,
                          timeout=START_UP)


def test_command_line_checks_a_data_dir(small_data):
    # The training scripts' other flags are ignored.
    result = run_command_line('--data_dir=' + small_data, '--epochs=3',
                              '--validation_size', '100', '--learning_rate',
                              '0.5')
    assert result.returncode == 0, result.stderr
    assert result.stdout == ('mnist_data.py: %s: 1000 training, 100 '
                             'validation, 500 test images\n' % small_data)


@pytest.mark.parametrize('args, status, words', [
    (['--validation_size=1100'], 1, ['1100 training images']),
    (['--validation_size=x'], 2, ['--validation_size', "'x'"]),
])
def test_command_line_errors(small_data, args, status, words):
    result = run_command_line('--data_dir=' + small_data, *args)
    assert result.returncode == status
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('mnist_data.py: error: ')
    for word in words:
        assert word in lines[0]
