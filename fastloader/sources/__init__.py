"""The input formats behind one seam: each format's module says which samples a split has and where
each one's bytes are (a SampleIndex with a Location per sample); `reading.py` reads them.

  formats.py        dataset.format -> the module that indexes it; build_index
  folder.py         ImageFolder trees, root/<split>/<class>/<image> (and the embedded demo, a folder)
  file_list.py      a split's text file of `relative/path label` lines
  exclude.py        dataset.exclude: the names every split leaves out
  webdataset.py     tar shards of `{key}.jpg` + `{key}.cls` members, indexed once and cached
  tar_members.py    one tar shard's members and their byte offsets, from its headers
  parquet.py        parquet and Arrow files of Hugging Face datasets: each row's image bytes, a byte range
  parquet_pages.py  where each row's image bytes lie in a parquet file, from its page headers
  table_scan.py     one parquet or Arrow file's scan: its rows' byte ranges and labels, or why it is unreadable
  arrow_file.py     an Arrow file memory-mapped: each value's byte range in the file
  hf_columns.py     a table's image and label columns and class names, by Hugging Face's conventions
  row_groups.py     rows of compressed parquet pages, read by decoding their row group (a cache per process)
  reading.py        Location, read_bytes / open_bytes: a whole file, or a byte range of a shard
  remote.py         the object store (s3://, gs://, az://, https://): listing, sizes and ETags, ranges, downloads
  node_cache.py     shards of a store on a local disk, fetched once per node, bounded, fetched ahead
  pack.py           writes a split as tar shards (`fastloader pack`)

A new format is one module with `index_split(config, split) -> SampleIndex` and one line in
formats.FORMATS.
"""
