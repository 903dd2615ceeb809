"""Let a light tox env use the one shared torch virtualenv instead of installing its own.

tox 4 keys a virtualenv by env name and recreates a shared `env_dir` whenever a
differently named env uses it, so the torch envs cannot simply share a directory.
Instead `torch` is built once and every other torch env gets a .pth file that adds
its site-packages (the editable install of this project included). If the shared
env is missing (e.g. `tox -e check` on a fresh clone) it is built first.
"""

import subprocess
import sys
import sysconfig
from pathlib import Path

work_dir = Path(sys.argv[1])
shared = work_dir / "torch"
if not (shared / "pyvenv.cfg").exists():
    subprocess.run(["tox", "-e", "torch", "--workdir", str(work_dir)], check=True)
python = shared / "bin" / "python"
site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      check=True, capture_output=True, text=True).stdout.strip()
pth = Path(sysconfig.get_paths()["purelib"]) / "_spyre_shared_torch.pth"
pth.write_text(f"import site; site.addsitedir({site!r})\n")
print(f"using the shared torch env at {shared}")
