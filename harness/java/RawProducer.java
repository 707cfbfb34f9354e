import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Writes records with Kafka's own Java client, including what aiokafka refuses to
 * write (a record with neither key nor value) and compressed records of any size.
 *
 *   java -cp '<kafka libs>/*' RawProducer.java BOOTSTRAP TOPIC COMPRESSION [TRANSACTIONAL_ID|- [CONFIG]] < records.jsonl
 *
 * COMPRESSION is none, gzip, snappy, lz4 or zstd. Each input line is one record:
 *
 *   {"partition": 0, "key": BYTES, "value": BYTES, "headers": [["name", BYTES], ...]}
 *
 * where BYTES is null, {"utf8": "text"}, {"hex": "ff00"} or {"zeros": 10485760}.
 * With a TRANSACTIONAL_ID the producer is transactional, as Kafka Streams or a Spring
 * application with exactly-once is, and the lines {"txn": "begin"}, {"txn": "commit"}
 * and {"txn": "abort"} begin, commit and abort a transaction. CONFIG is more producer
 * settings, "name=value;name=value" (say "batch.size=104857600;linger.ms=2000", to write
 * thousands of records in one batch).
 * Prints one line per record, in input order: {"partition": p, "offset": o}.
 */
public class RawProducer {
    private static byte[] bytes(JsonNode node) {
        if (node == null || node.isNull()) return null;
        if (node.has("utf8")) return node.get("utf8").asText().getBytes(StandardCharsets.UTF_8);
        if (node.has("hex")) return HexFormat.of().parseHex(node.get("hex").asText());
        if (node.has("zeros")) return new byte[node.get("zeros").asInt()];
        throw new IllegalArgumentException("unknown bytes spec: " + node);
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 3 || args.length > 5) {
            System.err.println("usage: RawProducer BOOTSTRAP TOPIC COMPRESSION [TRANSACTIONAL_ID|- [CONFIG]] < records.jsonl");
            System.exit(2);
        }
        ObjectMapper json = new ObjectMapper();
        List<ProducerRecord<byte[], byte[]>> records = new ArrayList<>();   // null: a transaction step
        List<String> steps = new ArrayList<>();
        long largest = 0;
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) continue;
                JsonNode spec = json.readTree(line);
                if (spec.has("txn")) {
                    records.add(null);
                    steps.add(spec.get("txn").asText());
                    continue;
                }
                byte[] key = bytes(spec.get("key"));
                byte[] value = bytes(spec.get("value"));
                RecordHeaders headers = new RecordHeaders();
                if (spec.has("headers")) {
                    for (JsonNode h : spec.get("headers")) headers.add(h.get(0).asText(), bytes(h.get(1)));
                }
                Integer partition = spec.has("partition") ? spec.get("partition").asInt() : null;
                largest = Math.max(largest, (key == null ? 0 : key.length) + (value == null ? 0 : value.length));
                records.add(new ProducerRecord<>(args[1], partition, key, value, headers));
            }
        }
        // The size limits apply to uncompressed records on the client side; the
        // broker checks the compressed batch against the topic's max.message.bytes.
        long room = Math.max(64L << 20, 2 * largest + (1 << 20));
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, args[2]);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        props.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, (int) Math.min(Integer.MAX_VALUE, room));
        props.put(ProducerConfig.BUFFER_MEMORY_CONFIG, room);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        boolean transactional = args.length >= 4 && !args[3].equals("-");
        if (transactional) props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[3]);
        if (args.length == 5) {
            for (String setting : args[4].split(";")) {
                if (setting.isBlank()) continue;
                String[] pair = setting.split("=", 2);
                props.put(pair[0], pair[1]);
            }
        }
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            if (transactional) producer.initTransactions();
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            int step = 0;
            for (ProducerRecord<byte[], byte[]> record : records) {
                if (record != null) {
                    sent.add(producer.send(record));
                    continue;
                }
                switch (steps.get(step++)) {
                    case "begin" -> producer.beginTransaction();
                    case "commit" -> producer.commitTransaction();
                    case "abort" -> {
                        producer.flush();           // the aborted records are written, then aborted
                        producer.abortTransaction();
                    }
                    default -> throw new IllegalArgumentException("unknown txn step " + steps.get(step - 1));
                }
            }
            producer.flush();
            for (Future<RecordMetadata> future : sent) {
                RecordMetadata meta = future.get();
                System.out.println("{\"partition\": " + meta.partition() + ", \"offset\": " + meta.offset() + "}");
            }
        }
    }
}
