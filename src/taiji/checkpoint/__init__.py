"""DURABLE STATE: checkpoints of the whole training state on disk or in an fsspec file system.

``config`` (what and when: ``Checkpoint``, the pure schedule), ``layout`` (names, the manifest,
which checkpoint is the latest complete one, which to prune, which worker writes which tensor),
``storage`` (file operations through fsspec; DCP writers and readers), ``writer`` (staging and
the background write), ``locate`` (which checkpoint, and its manifest: no torch), ``reader``
(checking and loading, ``load_checkpoint``, export).
"""
