"""Unit tests of cluster_utils: host lists."""

import pytest

import cluster_utils


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
