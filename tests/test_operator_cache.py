"""MXNet's operator functions compiled once per machine (mxoid/operator_cache.py): every
function the same code and documentation as MXNet's own ``exec`` makes, the file written
whole or not at all, and any damaged, foreign or unwritable cache only costs the time."""

import json
import os
import subprocess
import sys
import time

import pytest
from small_disk import on_small_disk

from mxoid import operator_cache, operator_file
from mxoid.operator_cache import HEADER, OperatorCache

HERE = os.path.dirname(os.path.abspath(__file__))

# Every operator function of MXNet's ndarray and symbol modules (numpy ones included),
# made again by MXNet's own _make_ndarray_function / _make_symbol_function with the
# builtin exec (for one of the operator's names: aliases share a handle): the same
# __code__ (bytecode, constants with the handle, flags, position table...) and name; and
# a digest of every docstring, to compare with a process without the cache. Also reports
# whether MXNet's generators had the cache's exec.
SAME_AS_EXEC = r"""
import ctypes, hashlib, json, sys, types
import mxnet as mx
from mxnet.base import _LIB, OpHandle, c_str, check_call, py_str
from mxnet.ndarray import register as nd_register
from mxnet.symbol import register as sym_register

served = [type(vars(m).get("exec")).__name__ for m in (nd_register, sym_register)]
for module in (nd_register, sym_register):
    vars(module).pop("exec", None)  # MXNet's own functions from here on: the builtin exec

names = {}
plist, size = ctypes.POINTER(ctypes.c_char_p)(), ctypes.c_uint()
check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(plist)))
for i in range(size.value):
    name, handle = py_str(plist[i]), OpHandle()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    names.setdefault(handle.value, []).append(name)  # an operator's aliases share its handle

def handle_of(code):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found = handle_of(const)
            if found is not None:
                return found
        elif type(const) is int and const in names:
            return const

checked, different, seen, docs = 0, [], set(), {}
for module_name, module in sorted(sys.modules.items()):
    if not module_name.startswith(("mxnet.ndarray", "mxnet.symbol")) or module is None:
        continue
    for attribute, function in sorted(vars(module).items()):
        if not isinstance(function, types.FunctionType) or id(function) in seen:
            continue
        code = function.__code__
        if "_imperative_invoke" in code.co_names:
            make = nd_register._make_ndarray_function
        elif "_symbol_creator" in code.co_names:
            make = sym_register._make_symbol_function
        else:
            continue
        handle = handle_of(code)
        if handle is None:
            continue
        seen.add(id(function))
        made = [make(OpHandle(handle), name, function.__name__) for name in names[handle]]
        checked += 1
        if not any((f.__code__, f.__name__) == (code, function.__name__) for f in made):
            different.append(module_name + "." + attribute)
        # as MXNet leaves it (it rewrites some numpy operators' docstrings after making them)
        docs[module_name + "." + attribute] = function.__doc__
digest = hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()
own = [vars(m)[name] is vars(mx.base)[name] and not hasattr(vars(m)[name], "mxoid_serves")
       for m in sys.modules.values() if getattr(m, "__name__", "").startswith("mxnet")
       for name in ("_init_op_module", "_init_np_op_module") if name in vars(m)]
print("RESULT " + json.dumps({"checked": checked, "different": different[:20], "served": served,
                              "docs": digest, "mxnets_own": len(own) >= 8 and all(own)}))
"""

TRAIN = r"""
import mxnet as mx, numpy as np, json
from mxoid import FinishAfter, MainLoop
X = np.random.RandomState(0).rand(40, 5).astype('float32')
y = (X[:, 0] > 0.5).astype('float32')
net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2), name='softmax')
loop = MainLoop(net, mx.io.NDArrayIter(X, y, batch_size=10),
                extensions=[FinishAfter(after_n_epochs=1)]).run()
numpy_operator = float(mx.nd.np.add(mx.nd.np.ones(2), 1).sum())
print("RESULT " + json.dumps([loop.status.iterations_done, numpy_operator]))
"""


def _python(code, cache, **env):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MXOID_CACHE_DIR": str(cache), **env}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def _result(process):
    out, err = process.communicate(timeout=240)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert process.returncode == 0 and lines, err[-3000:]
    return json.loads(lines[-1][7:])


def _run(code, cache, **env):
    return _result(_python(code, cache, **env))


def _cache_file(cache):
    return cache / f"mxnet-operators-2.{sys.implementation.cache_tag}.marshal"


def _codes(path):
    """The file's compiled functions by key (its sources left out)."""
    loaded = operator_file.load(str(path))
    del loaded[operator_file.SOURCES]
    return loaded


def _is_whole(path):
    data = path.read_bytes()
    assert data.startswith(HEADER)
    return len(_codes(path)) > 2000


def test_every_operator_function_is_the_one_mxnet_makes_with_or_without_the_file(tmp_path):
    cache = tmp_path / "cache"
    first = _run(SAME_AS_EXEC, cache)  # compiles every function and writes the file
    written = _cache_file(cache).stat()
    second = _run(SAME_AS_EXEC, cache)  # every function from the file
    assert _cache_file(cache).stat().st_mtime_ns == written.st_mtime_ns  # nothing new to write
    off = _run(SAME_AS_EXEC, tmp_path / "off", MXOID_OPERATOR_CACHE="0")
    assert off["served"] == ["NoneType", "NoneType"] and not (tmp_path / "off").exists()
    for result in (first, second, off):
        assert result["checked"] > 2300 and result["different"] == [], result
        assert (result["checked"], result["docs"]) == (off["checked"], off["docs"])
        assert result["mxnets_own"], result  # MXNet's _init_op_module... given back
    assert first["served"] == second["served"] == ["method", "method"]
    ((identity, sources),) = _sources(_cache_file(cache)).items()
    assert len(sources) > 2300 and "libmxnet.so" in identity  # the second served them all


def _sources(path):
    return operator_file.load(str(path))[operator_file.SOURCES]


def _rewrite_sources(path, change):
    """Rewrite the file's sources of this install, (identity, entries), with ``change``."""
    loaded = operator_file.load(str(path))
    ((identity, entries),) = loaded.pop(operator_file.SOURCES).items()
    operator_file.write(str(path), loaded, dict([change(identity, entries)]))


@pytest.mark.adversarial
def test_sources_of_another_mxnet_or_damaged_ones_are_written_again_by_mxnet(tmp_path):
    """The sources are served only for the library and files they were written from (the
    identity: paths, sizes, modification times); a damaged entry is written by MXNet
    again: every function as MXNet makes it, and the file written anew."""
    cache = tmp_path / "cache"
    off = _run(SAME_AS_EXEC, tmp_path / "off", MXOID_OPERATOR_CACHE="0")
    _run(TRAIN, cache)  # writes the file
    path = _cache_file(cache)

    def damage(identity, entries):
        names = sorted(entries)
        for name, broken in zip(names, ([], ("x",) * 6, (1, 2, 3, 4, 5, 6), None)):
            entries[name] = broken  # wrong length, types, no code behind its key, None
        generic, start, length, doc, flags, key = entries[names[4]]
        entries[names[4]] = (generic, start, length + 1, doc, flags, key)  # handle's length
        return identity, entries

    for change in (damage, lambda identity, entries: ("another MXNet", entries)):
        _rewrite_sources(path, change)
        written = path.stat().st_mtime_ns
        result = _run(SAME_AS_EXEC, cache)
        assert result["different"] == [] and result["mxnets_own"], result
        assert (result["checked"], result["docs"]) == (off["checked"], off["docs"])
        assert path.stat().st_mtime_ns != written  # MXNet wrote sources again: saved
        ((identity, sources),) = [i for i in _sources(path).items() if i[0] != "another MXNet"]
        assert len(sources) > 2300
        assert all(isinstance(entry, tuple) and len(entry) == 6 for entry in sources.values())
    # Another install's sources stay beside this one's: neither writes the file in turns.
    assert set(_sources(path)) == {identity, "another MXNet"}
    written = path.stat().st_mtime_ns
    assert _run(TRAIN, cache) == [4, 4.0]
    assert path.stat().st_mtime_ns == written


def test_training_runs_on_functions_from_the_file(tmp_path):
    """And the file of the earlier layout (read whole by every import) is removed."""
    cache = tmp_path / "cache"
    cache.mkdir()
    former = cache / f"mxnet-operators.{sys.implementation.cache_tag}.marshal"
    former.write_bytes(b"mxoid 0.5's file")
    assert _run(TRAIN, cache) == [4, 4.0]
    assert _is_whole(_cache_file(cache)) and not former.exists()
    assert _run(TRAIN, cache) == [4, 4.0]


@pytest.mark.adversarial
def test_an_import_reads_its_own_installs_sources_whatever_the_others_hold(tmp_path):
    """Another install's part of the file damaged: this one's import serves everything
    from its own part (nothing to write), and its next save drops the damaged part."""
    cache = tmp_path / "cache"
    assert _run(TRAIN, cache) == [4, 4.0]
    path = _cache_file(cache)
    loaded = operator_file.load(str(path))
    ((identity, entries),) = loaded.pop(operator_file.SOURCES).items()
    operator_file.write(str(path), loaded, {identity: entries, "another MXNet": {"x": 1}})
    file = operator_file.CacheFile(str(path))
    start, length = file.table[operator_file.SOURCES]["another MXNet"]
    start += file.start
    file.close()
    data = bytearray(path.read_bytes())
    data[start : start + length] = b"\xff" * length
    path.write_bytes(bytes(data))
    written = path.stat().st_mtime_ns
    assert _run(TRAIN, cache) == [4, 4.0]
    assert path.stat().st_mtime_ns == written  # served whole from its own part
    cache_of_one = OperatorCache(str(path))
    cache_of_one.code("def f():\n    return _symbol_creator(31, None)\n")  # compiles: saves
    cache_of_one.identity = identity
    cache_of_one.noted = {("m", "op", "f"): entries[next(iter(entries))]}
    assert cache_of_one.save()
    assert list(operator_file.load(str(path))[operator_file.SOURCES]) == [identity]


def test_a_save_without_sources_of_its_own_keeps_the_other_installs(tmp_path):
    """An import that served no sources (its MXNet's identity unknown) but compiled: the
    other installs' sources stay in the file, with the codes they need."""
    path = tmp_path / "ops.marshal"
    other = OperatorCache(str(path))
    source = "def f():\n    return _symbol_creator(31, None)\n"
    other.code(source)
    generic, key = other._parse(source, 0)[0], other._parse(source, 0)[3]
    entries = {("m", "op", "f"): (generic, generic.find("9"), 2, None, 0, key)}
    operator_file.write(str(path), other.used, {"another MXNet": entries})
    cache = OperatorCache(str(path))
    cache.code("def g():\n    return _imperative_invoke(4242, None)\n")  # compiles
    assert cache.compiled == 1 and cache.identity is None and cache.save()
    loaded = operator_file.load(str(path))
    assert loaded[operator_file.SOURCES] == {"another MXNet": entries}
    assert key in loaded and len(loaded) == 3  # its code, the new one, the sources


def test_a_script_that_imports_mxoid_first_has_the_cache_too(tmp_path):
    """``import mxoid`` before MXNet, and with no start-up file at all (``python -S``, the
    package on ``sys.path``): mxoid's own finder serves the functions."""
    served = "type(vars(mxnet.ndarray.register)['exec']).__name__"
    script = f"import mxoid, mxnet; print('RESULT \"%s\"' % {served})"
    assert _run(script, tmp_path / "cache") == "method"
    site = [p for p in sys.path if p.endswith("site-packages")]
    bare = f"import sys; sys.path[:0] = {[os.path.dirname(HERE)] + site!r}; {script}"
    process = subprocess.Popen(
        [sys.executable, "-S", "-c", bare],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MXOID_CACHE_DIR": str(tmp_path / "bare")},
    )
    assert _result(process) == "method"
    assert _is_whole(_cache_file(tmp_path / "bare"))


DAMAGED = [b"", b"garbage", HEADER, HEADER + b"\xff\x00\x13", b"\x00\x00\r\n" + HEADER[4:] + b"{}"]
DAMAGED_IDS = ["empty", "garbage", "header-only", "truncated", "another-python"]


@pytest.mark.adversarial
@pytest.mark.parametrize("content", DAMAGED, ids=DAMAGED_IDS)
def test_a_damaged_or_foreign_file_is_read_as_none_and_replaced(tmp_path, content):
    path = tmp_path / "ops.marshal"
    path.write_bytes(content)
    cache = OperatorCache(str(path))
    assert cache.known == {}
    code = cache.code("def f():\n    return _symbol_creator(31, None)\n")
    assert cache.compiled == 1 and cache.save()
    assert list(_codes(path).values())[0].co_consts[0].co_name == "f"
    assert code is not None


@pytest.mark.adversarial
def test_an_import_over_a_damaged_file_trains_and_replaces_it(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    _cache_file(cache).write_bytes(HEADER + b"\xff\x00\x13")
    assert _run(TRAIN, cache) == [4, 4.0]
    assert _is_whole(_cache_file(cache))


@pytest.mark.adversarial
def test_an_unwritable_folder_only_costs_the_compilation(tmp_path):
    (tmp_path / "file").write_text("a file where the folder should be")
    assert _run(TRAIN, tmp_path / "file" / "cache") == [4, 4.0]
    assert OperatorCache(str(tmp_path / "file" / "cache" / "x.marshal")).save()  # nothing compiled
    cache = OperatorCache(str(tmp_path / "file" / "cache" / "x.marshal"))
    assert cache.code("f = lambda: _imperative_invoke(7, 1)") is not None
    assert cache.save() is False and cache.used == {}


@pytest.mark.adversarial
def test_a_full_disk_leaves_no_file_and_no_temporary(tmp_path):
    """The cache folder on a 1 MiB tmpfs of its own (the file is about 6 MB)."""
    mount = tmp_path / "disk"
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    shell = f"MXOID_CACHE_DIR={mount}/cache {sys.executable} {script} && ls -a {mount}/cache"
    done = on_small_disk(mount, "size=1m", shell)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT [4, 4.0]" in done.stdout
    assert done.stdout.split()[-2:] == [".", ".."]  # neither the file nor a temporary one


@pytest.mark.adversarial
def test_processes_that_start_together_all_import_and_leave_one_whole_file(tmp_path):
    cache = tmp_path / "cache"
    processes = [_python(TRAIN, cache) for _ in range(3)]
    assert [_result(p) for p in processes] == [[4, 4.0]] * 3
    assert sorted(os.listdir(cache)) == [_cache_file(cache).name]
    assert _is_whole(_cache_file(cache))


@pytest.mark.adversarial
def test_a_killed_save_leaves_a_temporary_file_the_next_save_removes(tmp_path):
    target = tmp_path / "ops.marshal"
    old = tmp_path / "ops.marshal.0123456789ab.tmp"
    recent = tmp_path / "ops.marshal.ba9876543210.tmp"
    other = tmp_path / "notes.tmp"
    for path in (old, recent, other):
        path.write_bytes(b"half a file")
    hours_ago = time.time() - 2 * operator_file.STALE_SECONDS
    os.utime(old, (hours_ago, hours_ago))
    os.utime(other, (hours_ago, hours_ago))
    cache = OperatorCache(str(target))
    cache.code("def f():\n    return _symbol_creator(12345, None)\n")
    assert cache.save()
    assert not old.exists() and recent.exists() and other.exists()  # only its own, only old
    assert list(_codes(target).values())[0].co_consts


def test_only_mxnet_operator_sources_are_cached_and_the_handle_is_put_back(tmp_path):
    """Compiled as exec compiles it: the same code object, position table included, for
    handles of the same number of digits from one compilation."""
    cache = OperatorCache(str(tmp_path / "ops.marshal"))
    assert cache.code("x = 1") is None
    assert cache.code("a = _imperative_invoke(1, 2)\nb = _imperative_invoke(3, 4)") is None
    assert cache.code("a = _imperative_invoke(1, 9)") is None  # the stand-in's digits
    source = "def f(x=1, y=True):\n    return _imperative_invoke(4242, x, 4242.0, y)\n"
    first, second = cache.code(source), cache.code(source.replace("4242,", "7117,"))
    assert cache.compiled == 1  # one text, handle aside
    assert cache.code(source.replace("4242,", "77,")) is not None and cache.compiled == 2
    for code, handle in ((first, 4242), (second, 7117)):
        made = {"_imperative_invoke": lambda *a: a}
        exec(code, made)
        assert made["f"]() == (handle, 1, 4242.0, True)
        plain = {}
        exec(source.replace("4242,", f"{handle},"), {}, plain)
        assert plain["f"].__code__ == made["f"].__code__


def test_the_folder_is_the_native_librarys(tmp_path, monkeypatch):
    from mxoid.metrics import native

    monkeypatch.delenv("MXOID_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert operator_cache.cache_dir() == native._cache_dir() == str(tmp_path / "mxoid")
    monkeypatch.setenv("MXOID_CACHE_DIR", str(tmp_path / "given"))
    assert operator_cache.cache_dir() == native._cache_dir() == str(tmp_path / "given")
