"""The window layouts under their old import name, for :mod:`gemmar_aot.rules` alone.

``rules.py`` is compile code of the gemv recipe: its syntax tree, import statements
included, is in every gemv kernel's action key (``keys.RECIPE_CODE``). It imports
:class:`~gemmar_aot.model.layout.WindowLayout` and
:class:`~gemmar_aot.model.layout.CallLayout` from here, so this module keeps that import
working and nothing else: everything else of the model lives in :mod:`gemmar_aot.model`.
It goes at the next key schema, with the import in ``rules.py``.
"""

from __future__ import annotations

from gemmar_aot.model.layout import CallLayout, WindowLayout

__all__ = ["CallLayout", "WindowLayout"]
