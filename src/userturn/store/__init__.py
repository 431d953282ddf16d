"""The run folder: the database with all of its SQL, the read model, run state, lock, atomic writes, export."""
