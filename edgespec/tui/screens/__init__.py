"""Screens and dialogs of the chat app."""
