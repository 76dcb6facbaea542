"""The run folder, `<storage_path>/<name>/`, on a disk or an object store: the record a search keeps.

storage (local folders and pyarrow.fs URIs), run_folder (the claim, the one spec.yaml writer, which
folder a --resume continues), results (results.parquet's rows, derived from Tune's record of a
trial), searcher_record (searcher.json's format), retention (which checkpoints a trial keeps).

May import: search.definition and trainable/.
"""
