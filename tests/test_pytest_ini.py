"""pytest.ini's promise: the tests of real processes run in turn."""

import pytest


@pytest.mark.xdist_group('real')
def test_the_tests_of_real_processes_run_in_turn(request):
    # pytest-xdist's loadgroup puts the tests of a group on one worker by
    # renaming them; pytest 9.2 ignores the new name (pytest-xdist#1386),
    # and they ran side by side, failing now and then: requirements-test.txt
    # holds pytest below 9.2.
    if request.config.getoption('loadgroup', False):
        assert request.node.nodeid.endswith('@real'), (
            'pytest %s does not let pytest-xdist group tests'
            % pytest.__version__)
