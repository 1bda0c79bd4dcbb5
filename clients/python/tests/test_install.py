"""pip install works offline, with setuptools as the build backend, on the
interpreter that runs the suite (Debian's python3): nothing is fetched."""

import os
import shutil
import subprocess
import sys

from conftest import PKG


def test_pip_install_offline(tmp_path):
    # From a copy: setuptools builds in the source tree (build/, *.egg-info).
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("tests", "bench", "*.go", "__pycache__", "build", "*.egg-info"))
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index", "--no-deps",
                        "--target", str(target), str(src)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (target / "shardvisor" / "routing.py").exists()
    # The installed copy imports without the checkout, with the core's
    # standard library only (no framework is imported by "import shardvisor").
    code = ("import sys, shardvisor; assert shardvisor.__file__.startswith(sys.argv[1]), shardvisor.__file__; "
            "assert not {'django', 'sqlalchemy', 'psycopg2', 'psycopg'} & set(sys.modules), sorted(sys.modules); "
            "print(shardvisor.__version__)")
    p = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, cwd=str(tmp_path),
                       env=dict(env, PYTHONPATH=str(target)))
    assert p.returncode == 0 and p.stdout.strip() == "0.1.0", p.stdout + p.stderr
