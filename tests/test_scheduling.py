"""The order of ``pytest -n`` (tests/scheduling.py): units, longest first."""

import fnmatch
import textwrap

import scheduling


class Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid


def test_tests_sharing_a_module_fixture_are_one_unit_and_others_their_own(tmp_path):
    source = textwrap.dedent(
        """
        import pytest

        @pytest.fixture(scope="module")
        def trained(tmp_path_factory):
            return 1

        @pytest.fixture
        def cheap():
            return 2

        def test_a(trained, cheap):
            pass

        @pytest.mark.parametrize("x", [1, 2])
        def test_b(trained, x):
            pass

        def test_c(cheap):
            pass
        """
    )
    path = tmp_path / "test_sample.py"
    path.write_text(source)
    a, b1, b2, c = (
        f"{path}::test_a",
        f"{path}::test_b[1]",
        f"{path}::test_b[2]",
        f"{path}::test_c",
    )
    assert scheduling.scope(a) == scheduling.scope(b1) == scheduling.scope(b2) == f"{path}::trained"
    assert scheduling.scope(c) == c


def test_the_longest_units_come_first_each_whole_and_equal_ones_in_collection_order():
    light = [Item(f"tests/test_cli.py::test_bad_usage_gives_status_{i}") for i in range(3)]
    mnist = [
        Item(f"tests/test_examples.py::test_mnist_one_epoch_reaches_97_percent[{c}]")
        for c in ("one", "two")
    ]
    killed = Item(
        "tests/distributed/test_resumption_distributed.py::test_workers_that_would_resume_from_different_checkpoints_fail_together"
    )
    ordered = scheduling.longest_first([light[0], mnist[0], light[1], killed, mnist[1], light[2]])
    assert [i.nodeid for i in ordered] == [i.nodeid for i in [*mnist, killed, *light]]


def test_every_file_named_in_the_table_exists():
    for prefix in scheduling.SECONDS:
        assert (scheduling.ROOT / prefix.split("::")[0]).is_file(), prefix


def test_auto_starts_one_test_process_per_core_and_one_more(request, monkeypatch):
    """``-n auto`` as xdist resolves it (every implementation of the hook, the first
    answer): this suite's (tests/conftest.py), unless ``PYTEST_XDIST_AUTO_NUM_WORKERS``."""
    hook = request.config.hook.pytest_xdist_auto_num_workers
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert hook(config=request.config) == scheduling.cores() + 1
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert hook(config=request.config) == 5


def test_collection_imports_none_of_the_programs_the_tests_start():
    """``--doctest-modules`` imports every module it collects: every ``scripts`` folder (the
    programs the tests start; one trains for three CPU-seconds at import) matches a
    pattern of conftest's ``collect_ignore_glob`` (which pytest reads relative to
    tests/), so no test process spends its start-up running them."""
    import conftest

    tests = scheduling.ROOT / "tests"
    patterns = [str(tests / pattern) for pattern in conftest.collect_ignore_glob]
    folders = sorted(path for path in tests.rglob("scripts") if path.is_dir())
    assert len(folders) >= 3, folders  # checkpoint/, distributed/, main_loop/
    for folder in folders:
        assert any(fnmatch.fnmatch(str(folder), pattern) for pattern in patterns), folder
    assert not any(fnmatch.fnmatch(str(tests / "main_loop"), pattern) for pattern in patterns)
    assert "lean_site" in conftest.collect_ignore
