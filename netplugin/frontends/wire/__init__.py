"""The daemon protocol and its carriers: messages, codec, binary frame, code tables, client (standard library only)."""
