"""The ground: shared types every other package builds on. Imports nothing outside itself."""
