"""The embedded index store: the dense and keyword indexes of one knowledge base + embedding model, on disk in this
node's data dir, as append-only segments.

Layout of `root`:

    CURRENT              "gen-000042": the generation readers use; replaced atomically (tmp + os.replace)
    LOCK                 flock'ed by writers and by a merge while it commits; the kernel releases it when one dies
    MERGE                flock'ed by the one process merging segments of this index
    gen-000042/          a generation: manifest.json lists its segments, in order, and the deletes file of each
    gen-000041/          the previous generation, kept so a reader that just read CURRENT can still load it
    seg-000007/          a segment: the chunks one write added, or one merge rewrote; never modified
        chunk_ids.npy        int64 [n]: chunk id of row i
        vectors.npy          float32 [n, dimension], L2-normalised
        owners.json          owner -> the rows of its chunks
        term_counts.npz      scipy CSC matrix [n, segment vocabulary]: how often each token occurs in each row
        vocabulary.json      the segment's tokens, a JSON list; token i is column i of the term counts
        ann.faiss            segments of RAG_INDEX_ANN_THRESHOLD rows or more: IndexIVFFlat over the rows, ids = rows
        deletes-000042.npy   int64, sorted: the rows deleted as of generation 42 (tombstones); added, never changed
    tmp-*/, merging-*/   a segment or generation being written by a writer or a merge, or left by one that died

A write (store.py) takes the lock, loads the generation CURRENT names (segments are cached per process: only a
manifest is read), writes the new chunks as one new segment and, for each segment that lost chunks (their owner was
removed or upserted), a new deletes file; fsyncs them, then publishes gen-N+1 and swaps CURRENT (layout.py). Its
cost follows what it adds and deletes, not the size of the index. A crash at any point leaves CURRENT naming a
complete generation; the next writer removes what the dead one left.

Merges (merging.py) keep the segment count low (tiered, like Lucene's merge policy): a segment's level is how many
times RAG_INDEX_MERGE_FACTOR its live rows hold MERGE_FLOOR_ROWS; once a level holds that many segments, they are
rewritten as one (their live rows, in order), as is a segment with more than MERGE_DELETED_SHARE of its rows
deleted. Each chunk is rewritten about log_factor(chunks / floor) times in its life. A merge runs in a background
thread of the process that wrote, holding MERGE (one merge per index at a time) but not LOCK, so writes go on
meanwhile; it builds the merged segment in a merging-* dir, then under LOCK tombstones in it whatever the writes
made meanwhile deleted from its sources and publishes a generation with it in their place. Killed before that
publish, it leaves the old segments in force: nothing lost, nothing doubled.

BM25 is scored at query time from each segment's term counts (readers.py): corpus statistics (rows, document
frequencies, mean row length) are summed over the live rows of every segment, so the scores are those a single
index of the live chunks would give. Dense search is exact (a BLAS product over each segment's vectors) except in
segments with an IVF index (segments.py). The arrays are numpy/scipy files plus JSON rather than pickles: nothing
read from disk can execute code.

Readers keep the loaded generation in a per-process cache shared by every store on the same root, and read CURRENT
(a few microseconds) before each search, so web processes see new writes without restarting.

Earlier releases wrote format 2, a whole copy of the index per generation. Such a generation is searched in place
as one segment until it is converted to format 3 (conversion.py): by the next write, or by the first reader that
finds LOCK free, under LOCK and published like any write.
"""

import logging

# faiss logs at INFO which instruction set it loaded and why the others would not ("Could not load library with
# AVX512 support"), in every process that imports it; only its warnings matter.
logging.getLogger("faiss.loader").setLevel(logging.WARNING)
