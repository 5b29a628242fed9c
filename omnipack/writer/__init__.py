"""Write stage: packed rows into Energon webdataset shards with their metadata."""
