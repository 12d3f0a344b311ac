"""Built-in environments: the gymnasium adapter and Troupe's own small games.

Nothing here registers itself on import; ``legacy.plugin`` registers every environment by a lazy
``module:Class`` string, so a worker imports only the environment it actually steps.
"""
