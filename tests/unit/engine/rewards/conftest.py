"""Make this folder's helper modules (`reward_plugins_for_tests`, `reward_test_server`) importable
by plain name here and in reward worker processes, whatever pytest's import mode."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
