"""The P4 program's tests. Those that read the P4 sources as p4c does run them through the C
preprocessor first, and skip without one."""

import shutil

import pytest

CPP = shutil.which("cpp")
needs_cpp = pytest.mark.skipif(CPP is None, reason="no C preprocessor (cpp), which p4c needs too")
