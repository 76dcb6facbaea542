"""Running a search on Ray: everything that needs a live Ray or Tune's controller.

session (start or join Ray, the CLI's early local Ray, quiet hints, SIGTERM as Ctrl-C), preflight
(the checks and the claim before a search), capacity and gpu_probe (what the cluster holds, GPUs
spread or measured), tuner (the Tuner, new or restored), the callbacks Tune runs in the driver
(progress, disk_guard, mlflow_logger), ray_internals (every use of Ray's private parts, in one
place), writer_thread (their writes off the controller's thread) and collector (Python's cyclic
collector off while a search starts).

May import: search.outputs, search.searching, search.store, search.definition and trainable/.
"""
