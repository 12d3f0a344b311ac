"""Worker images: the wheelhouse and the Docker build."""
