"""Process-wide settings a run applies by one explicit call (`process.configure_process`): torch's
threads, the row pool that splits batches over worker threads and its core lease (`rows`), the
device, and whether glibc keeps freed memory (`allocator`)."""
