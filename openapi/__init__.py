"""The committed OpenAPI document of Logbus (``openapi.json``) and the tool that writes it."""
