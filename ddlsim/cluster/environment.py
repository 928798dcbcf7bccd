"""The environment a rank starts with: what it needs to run, nothing that unlocks anything.

Ranks run user-chosen models; they get the variables that decide how Python, torch and the
collective libraries run (an allowlist of names and prefixes) and never a store URL, the API's
token or any variable whose name says it holds a secret, whatever the parent process holds.
"""

import os
import re
from collections.abc import Mapping

# Names kept as they are, and prefixes whose variables are kept.
_KEEP_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "TZ",
        "TMPDIR",
        "TERM",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "GLIBC_TUNABLES",
        "CC",
        "CXX",
        "DDLSIM_DATA_DIR",
        "DDLSIM_FORCE_LOOPBACK",
    }
)
_KEEP_PREFIXES = (
    "LC_",
    "PYTHON",
    "CUDA_",
    "NCCL_",
    "GLOO_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "NUMEXPR_",
    "DNNL_",
    "ONEDNN_",
    "MALLOC_",
    "HF_",
    "TRANSFORMERS_",
    "NVIDIA_",
    "XDG_",
    "COV_CORE_",
    "COVERAGE_",
)
_SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|_KEY$|^DDLSIM_DB$", re.I)
_URL_WITH_CREDENTIALS = re.compile(r"://[^/@\s]*:[^@\s]*@")


def rank_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment reduced to what a rank needs, then ``extra`` on top."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if (name in _KEEP_NAMES or name.startswith(_KEEP_PREFIXES))
        and not _SECRET_NAME.search(name)
        and not _URL_WITH_CREDENTIALS.search(value)
    }
    kept.update(extra or {})
    return kept
