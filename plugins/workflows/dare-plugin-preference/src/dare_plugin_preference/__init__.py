"""The preference workflow: DPO-style objectives on likelihood surrogates over (prompt, chosen,
rejected) pairs. Registered as ``preference`` by :mod:`dare_plugin_preference.plugin`; the loop is
:mod:`dare_plugin_preference.workflow`, the pair files and generation :mod:`dare_plugin_preference.pairs`."""
