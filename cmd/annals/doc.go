// Command annals is the annals command line: migrate, append, read and a
// throwaway development database. Run `annals --help` for the commands.
package main
