"""The data path from workers to clients: frames and the element codec, compression, the TCP
and gRPC transfers, and the allocator settings that large elements need."""
