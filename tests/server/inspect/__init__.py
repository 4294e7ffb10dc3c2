"""The live inspector: its page, its feed, its sign-in sessions."""
