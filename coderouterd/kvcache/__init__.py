"""Slot files: llama-server KV caches on disk, and nothing else in coderouterd touches them.

- files.py: what a file is valid for (its key, its sidecar), whether it may be restored, which slots to save
  first and which files the disk budget deletes (pure);
- pool.py: one server's lane -> file map and its fixed pool of names (pure; affinity's slot table holds one);
- intent.py: what kvcache is asked to do (save, restore) and what came of it;
- cache.py: `KVCache`, the one path (`execute`) for a request's save and restore, the idle save and the save
  before a stop; checks a file before a restore and proves the restore by the answer's cached tokens;
- saver.py: the background saver; disk.py: the directory, in threads; budget.py: the budget against one file.

It speaks to llama-server only through servers/llamacpp.LlamaServer."""
