"""The catalog of Hugging Face configs (data; see README.md)."""
