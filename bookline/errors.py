"""Bookline's errors, one hierarchy with stable codes (defined in
:mod:`foundation.errors`, where every layer gets them): ``from bookline.errors import
FencedError``."""

from foundation.errors import *  # noqa: F403
from foundation.errors import __all__  # noqa: F401 - re-exported
