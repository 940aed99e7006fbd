"""MNIST in its four IDX files: download, read, split, and batches.

numpy and the standard library only, so that it runs before TensorFlow is
imported, or without it. Run on its own, it gets a data directory ready and
checks it, as launch_local.sh does before it starts the tasks:

    python mnist_data.py --data_dir=~/.cache/mnist [--data_mirror=URL]
"""

import argparse
import collections
import gzip
import hashlib
import os
import sys
import tempfile
import urllib.request
import zlib

import numpy as np

DEFAULT_DIR = os.path.join(os.path.expanduser('~'), '.cache', 'mnist')
FILES = {
    'train-images-idx3-ubyte.gz':
        '440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609',
    'train-labels-idx1-ubyte.gz':
        '3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c',
    't10k-images-idx3-ubyte.gz':
        '8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6',
    't10k-labels-idx1-ubyte.gz':
        'f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6',
}
MIRRORS = ['https://storage.googleapis.com/cvdf-datasets/mnist/',
           'https://ossci-datasets.s3.amazonaws.com/mnist/']
IMAGE_PIXELS = 28 * 28
NUM_CLASSES = 10

Split = collections.namedtuple('Split', ['images', 'labels'])
Datasets = collections.namedtuple('Datasets', ['train', 'validation', 'test'])


class DataError(Exception):
    pass


def download(url, sha256, path):
    """Fetches url to path, all or nothing, if its SHA-256 is sha256."""
    directory = os.path.dirname(path) or '.'
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, delete=False) as tmp:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                data = response.read()
            if hashlib.sha256(data).hexdigest() != sha256:
                raise DataError('%s has the wrong SHA-256' % url)
            tmp.write(data)
            tmp.close()
            os.replace(tmp.name, path)
        finally:
            if os.path.exists(tmp.name):
                os.unlink(tmp.name)


def download_mnist(data_dir, names, mirror=None):
    """Fetches the files `names` from mirror, else from the public mirrors in
    turn."""
    mirrors = [mirror.rstrip('/') + '/'] if mirror else MIRRORS
    for name in names:
        errors = []
        for url in mirrors:
            try:
                download(url + name, FILES[name], os.path.join(data_dir, name))
                break
            except (OSError, DataError) as e:
                errors.append(str(e))
        else:
            raise DataError(
                '%s not found in %s and not downloadable (%s); put the four '
                'files %s there, or point --data_dir at them'
                % (name, data_dir, errors[-1], ', '.join(FILES)))


def read_idx(path):
    """A gzipped IDX file of unsigned bytes as a numpy array."""
    try:
        with gzip.open(path, 'rb') as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise DataError('%s is unreadable, truncated or corrupt (%s)'
                        % (path, e))
    if len(data) < 4 or data[:3] != b'\0\0\x08':
        raise DataError('%s is not an IDX file of unsigned bytes' % path)
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = np.frombuffer(data[4:header], '>u4')
    if len(shape) != ndim or len(data) != header + int(np.prod(shape)):
        raise DataError('%s is truncated or corrupt: its size does not match '
                        'its header' % path)
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def read_split(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, prefix + '-images-idx3-ubyte.gz'))
    labels = read_idx(os.path.join(data_dir, prefix + '-labels-idx1-ubyte.gz'))
    if (images.ndim != 3 or images.shape[1] * images.shape[2] != IMAGE_PIXELS
            or labels.ndim != 1 or len(labels) != len(images)
            or labels.max(initial=0) >= NUM_CLASSES):
        raise DataError('%s/%s-*: expected N 28x28 images and N labels 0-9, '
                        'found images %s and labels %s'
                        % (data_dir, prefix, images.shape, labels.shape))
    # As stored, a byte a pixel and a label: a quarter of float32's memory.
    return Split(images.reshape(-1, IMAGE_PIXELS), labels)


def as_float(split):
    """Images and labels as the model takes them: each pixel a float32 in
    [0, 1], each label a one-hot row of NUM_CLASSES float32."""
    # One float32 array made, not a copy and then its quotient.
    return Split(np.divide(split.images, 255, dtype=np.float32),
                 np.eye(NUM_CLASSES, dtype=np.float32)[split.labels])


def read_data_sets(data_dir, validation_size, mirror=None):
    """MNIST, or any data set in its layout, split as TensorFlow's tutorial
    split it: the first validation_size training images are held out.
    Missing files are downloaded first."""
    missing = [name for name in FILES
               if not os.path.exists(os.path.join(data_dir, name))]
    if missing:
        download_mnist(data_dir, missing, mirror)
    train = read_split(data_dir, 'train')
    if len(train.images) <= validation_size:
        raise DataError('%s has %d training images, not more than '
                        '--validation_size=%d'
                        % (data_dir, len(train.images), validation_size))
    return Datasets(
        train=Split(train.images[validation_size:],
                    train.labels[validation_size:]),
        validation=Split(train.images[:validation_size],
                         train.labels[:validation_size]),
        test=read_split(data_dir, 't10k'))


def epoch_batches(split, batch_size, rng):
    """One pass over split in a new random order, in full batches, each
    as_float."""
    order = rng.permutation(len(split.images))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        batch = order[start:start + batch_size]
        yield as_float(Split(split.images[batch], split.labels[batch]))


def main(argv):
    """Downloads what is missing and reads it all; one line either way.

    Flags it does not know are ignored, so that a launcher can hand it the
    training script's flags as they are.
    """
    parser = argparse.ArgumentParser(allow_abbrev=False,
                                     usage=argparse.SUPPRESS)
    # ~ as in a shell, which does not expand it after '='.
    parser.add_argument('--data_dir', default=DEFAULT_DIR,
                        type=os.path.expanduser)
    parser.add_argument('--data_mirror')
    parser.add_argument('--validation_size', type=int, default=5000)
    args, _ = parser.parse_known_args(argv)
    try:
        mnist = read_data_sets(args.data_dir, args.validation_size,
                               args.data_mirror)
    except DataError as e:
        print('mnist_data.py: error: %s' % e, file=sys.stderr)
        return 1
    print('mnist_data.py: %s: %d training, %d validation, %d test images'
          % ((args.data_dir,) + tuple(len(s.images) for s in mnist)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
