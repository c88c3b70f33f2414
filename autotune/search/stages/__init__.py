"""The search's stages, one module each, in order: ``probe``, ``knobs``, ``refine`` and
``race`` (the race and its first-launch check, one loop). ``driver.STAGES`` names them, with
what a search stopped before each never began; ``docs/search.md`` states them once.
"""
