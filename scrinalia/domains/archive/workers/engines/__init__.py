"""Engines: what a worker loads to do its work. Each module declares ``EngineSpec``s.

Importing these modules never imports torch or transformers (the API reads the signatures and calls
``describe``); only ``load`` does, in a runner's child.
"""
