"""Install mxoid's start-up file beside the package; everything else is in pyproject.toml.

``mxoid-mxnet-compat.pth`` in ``site-packages`` makes ``import mxnet`` work on today's
NumPy and Python even when a script imports MXNet before mxoid (see ``mxoid/compat.py``).
Setuptools installs only packages from pyproject.toml, so the file is added here, to
regular and to editable installs.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

START_UP_FILE = "mxoid-mxnet-compat.pth"
# Run at interpreter start-up: a finder that, the first time MXNet is imported, loads
# mxoid/compat.py by its path (without importing the mxoid package, so that a checkout
# of mxoid elsewhere is not shadowed) and hands over to its import hook.
START_UP_CODE = """
class _MxoidStartUpHook:
    hook = None

    def find_spec(self, name, path=None, target=None):
        if self.hook is None:
            if name != "mxnet":
                return None
            import importlib.util, os
            package = importlib.util.find_spec("mxoid")
            if os.environ.get("MXOID_NO_COMPAT") or not package or not package.origin:
                self.hook = False
                return None
            where = os.path.join(os.path.dirname(package.origin), "compat.py")
            spec = importlib.util.spec_from_file_location("mxoid_compat_at_start_up", where)
            compat = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(compat)
            self.hook = compat._MXNetImportHook()
        return self.hook.find_spec(name, path, target) if self.hook else None

sys.meta_path.insert(0, _MxoidStartUpHook())
"""
# A .pth file runs only lines that start with "import".
START_UP_LINE = f"import sys; exec({START_UP_CODE!r})\n"


def write_start_up_file(folder):
    with open(os.path.join(folder, START_UP_FILE), "w") as handle:
        handle.write(START_UP_LINE)


class BuildPy(build_py):
    def run(self):
        super().run()
        write_start_up_file(self.build_lib)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, START_UP_FILE)]


class EditableWheel(editable_wheel):
    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        write_start_up_file(unpacked_wheel)
        return result


setup(cmdclass={"build_py": BuildPy, "editable_wheel": EditableWheel})
