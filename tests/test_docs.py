"""The README and docs/, as a user reads them: every link there, and every
sample output a line that the code can print."""

import ast
import glob
import os
import re

from conftest import REPO

DOCS = [os.path.join(REPO, 'README.md')] + sorted(
    glob.glob(os.path.join(REPO, 'docs', '*.md')))
# What launch_local.sh prints besides the tasks' own lines.
LAUNCHER_LINES = [
    r'(async|sync|tf2): \d+ ps \(\S+\), \d+ workers \(\S+\)'
    r'(, an evaluator)?(, worker \d+ \d+ ms slower a step)?'
    r'(, \d+ at first, the rest \d+ s later)?, logs in \S+',
    r'---- (async|sync|tf2), \d+ workers, logs in \S+',
    r'worker \d+: exit \d+(, final accuracy = \S+)?(, on GPU \d+ of \d+)?',
    r'worker \d+: not started: the chief ended first']
# The conversions of Python's %-formats in the lines our code prints.
FORMATS = {'%d': r'-?\d+', '%s': r'.+', '%g': r'[\d.e+-]+',
           '%.1f': r'[\d.]+', '%.2f': r'[\d.]+', '%.0f': r'\d+'}


def printed_lines():
    """A regex for each %-format string in our code, which a line it prints
    must match."""
    patterns = []
    for path in glob.glob(os.path.join(REPO, '*.py')) + glob.glob(
            os.path.join(REPO, 'ps_cluster', '*.py')):
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)
                    and isinstance(node.left, ast.Constant)
                    and isinstance(node.left.value, str)):
                parts = re.split(r'(%\.?\d?[dsgf])', node.left.value)
                patterns.append(''.join(
                    FORMATS.get(part, re.escape(part)) for part in parts))
    return patterns + LAUNCHER_LINES


def samples(path):
    """The lines of the fenced blocks without a language: sample output."""
    lines, fence = [], None
    with open(path) as f:
        for line in f:
            opens = re.match(r' *```(\w*)$', line)
            if opens:
                fence = None if fence is not None else opens.group(1)
            elif fence == '' and line.strip():
                lines.append(line.strip())
    return lines


def test_every_sample_line_is_one_the_code_prints():
    patterns = [re.compile(p) for p in printed_lines()]
    shown = [(os.path.basename(path), line) for path in DOCS
             for line in samples(path)]
    assert len(shown) > 20
    assert [(path, line) for path, line in shown
            if not any(p.fullmatch(line) for p in patterns)] == []


def test_every_link_is_there():
    missing = []
    for path in DOCS:
        with open(path) as f:
            for target in re.findall(r'\]\(([^)#:]+)(?:#[^)]*)?\)', f.read()):
                if not os.path.exists(os.path.join(os.path.dirname(path),
                                                   target)):
                    missing.append((os.path.basename(path), target))
    assert missing == []
