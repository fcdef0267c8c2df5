"""The simulation dataset on disk: shard schema, writer, reader and (H, T) training windows."""
