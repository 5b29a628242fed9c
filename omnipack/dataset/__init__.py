"""The dataset format, shared by the write stage, the loader and the tools: the packed-row contract,
the row codec, shard writing and reading, and Energon/omnipack metadata."""
