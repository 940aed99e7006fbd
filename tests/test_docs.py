"""The README and docs/, as a user reads them: every link there, every
sample output a line that the code can print, every command's flags ones
that it takes, and all of it within 8,000 words."""

import ast
import glob
import os
import re
import shlex

import pytest

from conftest import REPO, script_help

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


def test_the_docs_keep_within_their_words():
    # A user reads the README and docs/ whole: 8,000 words at most.
    words = 0
    for path in DOCS:
        with open(path) as f:
            words += len(f.read().split())
    assert words <= 8000, words


# A command begins a line of a block, or inline code.
LAUNCHER = re.compile(r'(?:^[ \t]*|`)(\./launch_local\.sh\b[^`\n]*)', re.M)
SCRIPT = re.compile(r'(?:^[ \t]*|`)(python (?:\S*/)?mnist_dist_(?:async|sync|'
                    r'tf2)\.py\b[^`\n]*)', re.M)
MODES = {'async': ['async'], 'sync': ['sync'], 'tf2': ['tf2'],
         'compare': ['async', 'sync'], 'straggler': ['async', 'sync']}


def shown_commands():
    """(doc, command) of each launch_local.sh or script command the docs
    show, in a block or inline."""
    for path in DOCS:
        with open(path) as f:
            text = f.read().replace('\\\n', ' ')
        # Inline code that a line breaks is one command; a block's lines
        # are one each.
        parts = re.split(r'(^ *```.*?^ *```)', text, flags=re.M | re.S)
        text = ''.join(part if part.lstrip().startswith('```') else re.sub(
            r'`[^`]+`', lambda m: ' '.join(m.group(0).split()), part)
            for part in parts)
        for pattern in (LAUNCHER, SCRIPT):
            for match in pattern.finditer(text):
                yield os.path.basename(path), match.group(1)


@pytest.mark.slow
def test_every_command_shown_takes_its_flags():
    """Each command the docs show names the launcher's options and the
    flags of the scripts it runs, as their --help lists them."""
    with open(os.path.join(REPO, 'launch_local.sh')) as f:
        usage = re.search(r'usage_line="(.*)"', f.read()).group(1)
    options = set(re.findall(r'\[(-\w)', usage))
    defined = {script: set(re.findall(r'--(?:\[no\])?(\w+):',
                                      script_help(script)[0]))
               for script in ('async', 'sync', 'tf2')}
    wrong, shown = [], list(shown_commands())
    assert len(shown) > 15
    for doc, command in shown:
        words = shlex.split(command.split('#')[0])
        if words[0] == './launch_local.sh':
            mode = next((w for w in words if w in MODES), None)
            at = words.index(mode) if mode else len(words)
            given = [w for w in words[1:at] if w.startswith('-')]
            scripts, flags = MODES.get(mode, []), words[at + 1:]
            wrong += [(doc, command, w) for w in given if w not in options]
        else:
            scripts, flags = [re.search(r'mnist_dist_(\w+)', words[1]).group(
                1)], words[2:]
        for flag in flags:
            name = re.match(r'--(?:no)?(\w+)', flag)
            if name and not all(name.group(1) in defined[s]
                                for s in scripts):
                wrong.append((doc, command, flag))
    assert wrong == []
