"""The example shop and ``tasklease demo``, shipped in the package so the demo runs from a wheel.

:mod:`tasklease.demo.shop` is the router the demo serves; :mod:`tasklease.demo.run` runs it end
to end against the local emulator with faults injected.
"""

__all__: list[str] = []
