"""sandbox-controller: self-hosted sandboxes for OpenAI's Agents API."""

__version__ = "0.1.0"
