"""Bookline's version: one string, read by the CLI, the OpenAPI document and the public
package (``bookline.__version__``)."""

__version__ = "0.1.0"
