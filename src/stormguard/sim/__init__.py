"""The simulator behind ``stormguard simulate`` (the ``sim`` extra).

Private modules: ``_occ``, ``_storm``, ``_budget`` and ``_layers`` are the
scenarios, ``_engine`` seeds and progress, ``_output`` CSV/JSON, ``_plots`` PNGs
(matplotlib, imported only when drawing) and ``_cli`` the click command. They
drive the library's own core objects in virtual time.
"""
