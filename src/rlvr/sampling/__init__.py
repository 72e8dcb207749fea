"""Which prompts a step rolls out: prompt selectors with their state for exact resume
(`selection`: MoPPS's Beta posteriors)."""
