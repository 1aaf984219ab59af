"""What people watch: request records, logs, follow streams and the web page."""
