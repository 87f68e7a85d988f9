"""Puts ``tfcoord-aliases.pth`` at the root of the wheel, i.e. into site-packages.

setuptools has no declarative way to install a .pth file; the wheel's purelib root is
where Python's ``site`` module looks for them.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "tfcoord-aliases.pth"


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(Path(__file__).parent / PTH), str(Path(self.build_lib) / PTH))


setup(cmdclass={"build_py": BuildWithPth})
