"""Where a split's samples come from: one Source protocol (protocol.py) under every format, ours
and the user's, and the one way to read a sample's bytes (reading.py).

  protocol.py       the Source protocol (name, samples(), read(item), identity()) and the table of opened sources
  registry.py       dataset.format's registered formats (register_format), and IndexedSource, the built-ins' source
  formats.py        a split's source (given, its `source` factory, its `sources`, or its format's) and its index
  user_source.py    a user's source: its factory called, what it gives checked, indexed; its length checked per epoch
  source_reads.py   a source's read() as encoded bytes (a decoded image: a PPM)
  sqlite_table.py   a SQLite table of encoded images (SQLiteSource), a source shipped as an example
  torch_dataset.py  from_dataset: a map-style torch Dataset of (image, label) items as a source
  class_names.py    a file of class names, one a line
  folder.py         ImageFolder trees, root/<split>/<class>/<image> (and the embedded demo, a folder)
  file_list.py      a split's text file of `relative/path label` lines
  exclude.py        dataset.exclude: the names every split leaves out
  multi.py          a split's `sources`: each indexed as a split of its own, joined into one index
  webdataset.py     tar shards of `{key}.jpg` + `{key}.cls` members, indexed once and cached
  tar_members.py    one tar shard's members and their byte offsets, from its headers
  parquet.py        parquet and Arrow files of Hugging Face datasets: each row's image bytes, a byte range
  parquet_pages.py  where each row's image bytes lie in a parquet file, from its page headers
  table_scan.py     one parquet or Arrow file's scan: its rows' byte ranges and labels, or why it is unreadable
  arrow_file.py     an Arrow file memory-mapped: each value's byte range in the file
  hf_columns.py     a table's image and label columns and class names, by Hugging Face's conventions
  row_groups.py     rows of compressed parquet pages, read by decoding their row group (a cache per process)
  urls.py           which paths are object-store URLs (a leaf)
  reading.py        read_bytes / open_bytes: a whole file, a byte range of a shard, a source's sample
  stores.py         dataset.remote as one value, opened where a split is prepared, released with its loader
  remote.py         the object store (s3://, gs://, az://, https://): listing, sizes and ETags, ranges, downloads
  file_locks.py     the node cache's flocks, waited for while their holder gets on
  cache_folder.py   a node cache's folder: the names of its shards, downloads and locks; what a killed run left
  cache_space.py    a node cache's limit: eviction (never while read), room reserved before a download, its counts
  cache_requests.py forked readers ask the process that opened a node cache to fetch for them
  node_cache.py     shards of a store on a local disk, fetched once per node; the open caches, held by loaders
  fetch_ahead.py    the shards an epoch will read, fetched ahead in its order

A new format is one module that calls `register_format(Format(name, open))` (docs/sources.md).
"""
from .protocol import Samples, Source
from .registry import Format, register_format
from .torch_dataset import from_dataset

__all__ = ["Format", "Samples", "Source", "from_dataset", "register_format"]
